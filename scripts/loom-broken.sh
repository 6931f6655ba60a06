#!/usr/bin/env bash
# Shows that the loom models can fail: builds shmflow with one ordering deliberately broken
# (SHMFLOW_BROKEN, which build.rs turns into `--cfg shmflow_broken="…"`) and runs the model
# that must catch it: one of the library's own (src/loom_models/), or one of loom-tests/,
# written against the public API as a user writes theirs. The run must fail, and fail with the
# expected diagnosis (a causality violation, a deadlock, or a failed assertion of the model);
# a model that passes, or fails for another reason, fails this script.
set -euo pipefail
cd "$(dirname "$0")/.."

# The test executable of `target` (`--lib`, or `--test NAME` of loom-tests) built with
# `broken`; only shmflow and the tests are rebuilt from one variant to the next.
build() {
    local broken=$1 package=$2
    shift 2
    SHMFLOW_BROKEN="$broken" RUSTFLAGS="--cfg shmflow_loom" cargo test -q -p "$package" "$@" \
        --profile test --no-run --target-dir target/loom-broken --message-format=json |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1
}

run() {
    local broken=$1 exe=$2 test=$3 expected=$4
    local out status=0
    if [[ -z "$exe" ]]; then
        echo "FAILED: the library did not build with shmflow_broken=\"$broken\""
        exit 1
    fi
    out=$("$exe" --exact "$test" 2>&1) || status=$?
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

caught=0

# A model of the library's own (src/loom_models/).
check() {
    local broken=$1 test=$2 expected=$3
    echo "== shmflow_broken=\"$broken\": loom_models::$test must fail with \"$expected\""
    run "$broken" "$(build "$broken" shmflow --lib)" "loom_models::$test" "$expected"
    caught=$((caught + 1))
}

# A model of loom-tests/ (the public API): `file` is its test file.
check_user() {
    local broken=$1 file=$2 test=$3 expected=$4
    echo "== shmflow_broken=\"$broken\": loom-tests/tests/$file.rs $test must fail with \"$expected\""
    run "$broken" "$(build "$broken" shmflow-loom-tests --test "$file")" "$test" "$expected"
    caught=$((caught + 1))
}

# The gate's checkpoint alignment is single-threaded: a deterministic model (every order of a
# few channels' records, barriers, announcements, closings and ticks) checks it instead of loom.
check_model() {
    local broken=$1 test=$2 expected=$3
    echo "== shmflow_broken=\"$broken\": $test must fail with \"$expected\""
    local exe
    exe=$(SHMFLOW_BROKEN="$broken" cargo test -q -p shmflow --lib --profile test --no-run \
        --target-dir target/model-broken --message-format=json |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
    run "$broken" "$exe" "endpoint::gate::align::tests::$test" "$expected"
    caught=$((caught + 1))
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
check lane_relaxed priority_lane_hands_over_every_event_whole_and_in_order "left == right"
check_model align_silent_cancel mixed_modes_and_a_newer_barrier_cancel_cleanly "vanished"
check_model align_keep_holding unaligned_barriers_hand_back_what_they_overtook_exactly_once "released twice"

check_user commit_relaxed stream a_stream_is_read_in_order_to_its_end "Causality violation"
check_user commit_relaxed stream a_batch_is_read_whole_and_in_order "Causality violation"
check_user batch_header_unheld stream a_batch_is_read_whole_and_in_order "Causality violation"
check_user no_recheck stream a_producer_blocked_on_a_full_pool_wakes "deadlock;"
check_user drop_silent stream a_consumer_dropped_while_the_producer_waits_gives_closed "deadlock;"
check_user close_counts_taken stream close_timeout_returns_once_everything_is_read "close returned before the reader read"
check_user lane_relaxed events a_priority_event_overtakes_queued_records "the event as sent"
check_user gate_fast_ignores_lane gate a_priority_event_overtakes_queued_records_through_a_gate "the event after a record sent after it"
check_user align_release_early gate an_aligned_barrier_is_released_once_after_both_channels "the barrier between the records"
check_user align_keep_holding gate an_unaligned_barrier_hands_back_what_it_overtook "one release"
check_user debloat_done_never debloat a_producer_held_to_the_debloating_cap_goes_on "deadlock;"
check_user doorbell_unrung asynch an_awaiting_consumer_is_woken_by_a_sending_thread "deadlock;"
echo "all $caught broken variants were caught"
