"""librdkafka's repeated complaints: logged once, counted, summed up while they last, cleared once (issue 14).

Pure logic on real ``logging`` records; ``tests/integration/test_newcomer_kafka.py`` shows it on the real daemon.
"""

from __future__ import annotations

import logging
import re
import time

import pytest

from globald.kafka.client_log import RepeatedProblems, problem_key

REFUSED = ("FAIL [globald#consumer-2] [thrd:127.0.0.1:1/bootstrap]: 127.0.0.1:1/bootstrap: Connect to "
           "ipv4#127.0.0.1:1 failed: Connection refused (after {}ms in state CONNECT)")


def test_lines_differing_only_in_what_changes_at_each_retry_are_one_problem() -> None:
    assert problem_key(REFUSED.format(0)) == problem_key(REFUSED.format(912))
    assert problem_key("x (after 3ms in state UP, 4 identical error(s) suppressed)") == problem_key("x")
    assert problem_key(REFUSED.format(0)) != problem_key(REFUSED.format(0).replace("127.0.0.1:1", "127.0.0.1:2"))


def test_a_problem_is_logged_once_then_counted_then_cleared(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("test.newcomer.librdkafka")
    f = RepeatedProblems(report_every=0.3, straggling=0.3)
    log.addFilter(f)
    try:
        with caplog.at_level(logging.INFO):
            for i in range(50):
                log.error(REFUSED.format(i))
            log.warning("another problem")
            time.sleep(0.35)
            log.error(REFUSED.format(99))  # the periodic count
            log.info("not a problem: always through")
            with caplog.at_level(logging.INFO, logger="globald.kafka.client_log"):
                f.cleared()
            log.error(REFUSED.format(100))  # queued before it cleared: dropped
            time.sleep(0.35)
            log.error(REFUSED.format(101))  # back for real: a new first line
    finally:
        log.removeFilter(f)
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said[0] == ("ERROR", REFUSED.format(0))
    assert said[1] == ("WARNING", "another problem")
    assert said[2][0] == "ERROR" and said[2][1].startswith("still: " + REFUSED.format(99))
    assert "(50 more time(s) in the last" in said[2][1]
    assert said[3] == ("INFO", "not a problem: always through")
    cleared = [m for _, m in said[4:6]]
    # ~0.35 s went by; a loaded machine may round it up to 1 s
    assert any(re.match(r"librdkafka problem cleared after [01]s \(51 time\(s\) in all\): ", m)
               and m.endswith(REFUSED.format(0)) for m in cleared), said
    assert any("another problem" in m for m in cleared)
    assert said[6:] == [("ERROR", REFUSED.format(101))]


def test_the_0_9_protoerr_line_is_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    """KAFKA-TESTING.md: librdkafka 2.x parsing a 0.9 broker's Metadata v0 answer sometimes logs this; harmless."""
    from globald.kafka.client_log import kafka_log

    with caplog.at_level(logging.INFO, logger="globald.librdkafka"):
        kafka_log.error("PROTOERR [rdkafka#producer-1] [thrd:127.0.0.1:9/0]: 127.0.0.1:9/0: Protocol parse failure "
                        "for Metadata v0 at 40/60 (rd_kafka_parse_Metadata0:1) (incorrect broker.version.fallback?): "
                        "Not enough room in tmpabuf")
        kafka_log.error("PROTOERR [rdkafka#producer-1] 127.0.0.1:9/0: Protocol parse failure for Produce v2")
    assert [r.getMessage()[-20:] for r in caplog.records] == ["e failure for Produce v2"[-20:]]


def test_two_clients_meeting_the_same_broker_problem_are_one_problem() -> None:
    """The daemon's consumer and the cluster worker's (kafka.worker) both meet a broker that refuses them: one
    problem, logged once, not once per client."""
    from globald.kafka.client_log import problem_key

    line = ("FAIL [globald#consumer-{n}] [thrd:127.0.0.1:9/bootstrap]: 127.0.0.1:9/bootstrap: Connect to "
            "ipv4#127.0.0.1:9 failed: Connection refused (after 0ms in state CONNECT)")
    assert problem_key(line.format(n=2)) == problem_key(line.format(n=3))
    assert "Connection refused" in problem_key(line.format(n=2))
