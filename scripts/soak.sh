#!/usr/bin/env bash
# Long reliability run (not part of CI): 1000 SIGKILL trials per side, then a soak of random
# record sizes with random stalls on both sides and checksums (default 10 minutes).
#   scripts/soak.sh [SOAK_SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-600}
echo "== 1000 kills per side"
SHMFLOW_KILL_TRIALS=1000 cargo test --release --test kill -- --nocapture --test-threads=1 \
    producer_killed_at_random consumer_killed_at_random 2>&1 | grep -E "kills:|test result|panicked"
echo "== soak for ${secs} s"
SHMFLOW_SOAK_SECS=$secs cargo test --release --test kill -- --ignored --nocapture soak_random_sizes_and_stalls 2>&1 \
    | grep -E "^soak:|test result|panicked"
