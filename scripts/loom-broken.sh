#!/usr/bin/env bash
# Shows that the loom models can fail: builds shmflow with one ordering deliberately broken
# (cfg shmflow_broken) and runs the model that must catch it. The run must fail, and fail with
# the expected loom diagnosis (a causality violation, a deadlock, or a wrong value); a model
# that passes, or fails for another reason, fails this script.
set -euo pipefail
cd "$(dirname "$0")/.."

check() {
    local broken=$1 test=$2 expected=$3
    echo "== shmflow_broken=\"$broken\": $test must fail with \"$expected\""
    local out exe status=0
    # The broken cfg goes to shmflow alone (`cargo rustc -- …`), so the dependencies, built
    # once under `--cfg shmflow_loom`, are not rebuilt for every variant.
    exe=$(RUSTFLAGS="--cfg shmflow_loom" cargo rustc -q -p shmflow --lib --profile test \
        --target-dir target/loom-broken --message-format=json \
        -- --cfg "shmflow_broken=\"$broken\"" |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
    if [[ -z "$exe" ]]; then
        echo "FAILED: the library did not build with shmflow_broken=\"$broken\""
        exit 1
    fi
    out=$("$exe" --exact "loom_models::$test" 2>&1) || status=$?
    if [[ $status -eq 0 ]]; then
        echo "$out" | tail -5
        echo "FAILED: the model passed; it did not catch shmflow_broken=\"$broken\""
        exit 1
    fi
    if ! grep -qF "$expected" <<<"$out"; then
        echo "$out" | grep -v '^ *[0-9]*: \|^ *at ' | tail -20
        echo "FAILED: $test failed, but not with \"$expected\""
        exit 1
    fi
    echo "   caught: $(grep -m1 -F "$expected" <<<"$out" | cut -c1-150)"
}

# The gate's checkpoint alignment is single-threaded: a deterministic model (every order of a
# few channels' records, barriers, announcements, closings and ticks) checks it instead of loom.
check_model() {
    local broken=$1 test=$2 expected=$3
    echo "== shmflow_broken=\"$broken\": $test must fail with \"$expected\""
    local out exe status=0
    exe=$(cargo rustc -q -p shmflow --lib --profile test --target-dir target/model-broken \
        --message-format=json -- --cfg "shmflow_broken=\"$broken\"" |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
    if [[ -z "$exe" ]]; then
        echo "FAILED: the library did not build with shmflow_broken=\"$broken\""
        exit 1
    fi
    out=$("$exe" --exact "endpoint::gate::align::tests::$test" 2>&1) || status=$?
    if [[ $status -eq 0 ]]; then
        echo "FAILED: the model passed; it did not catch shmflow_broken=\"$broken\""
        exit 1
    fi
    if ! grep -qF "$expected" <<<"$out"; then
        echo "$out" | tail -20
        echo "FAILED: $test failed, but not with \"$expected\""
        exit 1
    fi
    echo "   caught: $(grep -m1 -F "$expected" <<<"$out" | cut -c1-150)"
}

check commit_relaxed consumer_never_reads_uncommitted_bytes "Causality violation"
check no_recheck consumer_waiting_for_data_always_wakes "deadlock;"
check no_recheck producer_waiting_for_a_segment_always_wakes "deadlock;"
check notify_load_first consumer_waiting_for_data_always_wakes "deadlock;"
check ring_relaxed ring_fifo_across_wrap_around "left == right"
check flusher_sleep_store flusher_sleeping_without_a_timer_never_misses_a_publication "deadlock;"
check no_waiter_fence consumer_waiting_for_records_published_one_by_one_always_wakes "deadlock;"
check async_no_recheck async_waiter_through_the_bridge_always_wakes "deadlock;"
check bridge_late_nudge async_waiter_through_the_bridge_always_wakes "deadlock;"
check doorbell_unrung async_waiter_on_the_doorbell_always_wakes "deadlock;"
check async_no_recheck async_waiter_on_the_doorbell_always_wakes "deadlock;"
check debloat_done_late producer_held_back_by_the_cap_wakes_when_a_segment_is_done "deadlock;"
check debloat_silent_raise producer_held_back_by_the_cap_wakes_when_it_rises "deadlock;"
check mark_after_notify a_gate_waiting_for_a_marked_socket_always_wakes "deadlock;"
check light_ignores_no_fence waiter_of_an_rmw_only_notifier_parks_without_the_barrier_and_wakes "deadlock;"
check_model align_silent_cancel mixed_modes_and_a_newer_barrier_cancel_cleanly "vanished"
check_model align_keep_holding unaligned_barriers_hand_back_what_they_overtook_exactly_once "released twice"
echo "all 16 broken variants were caught"
