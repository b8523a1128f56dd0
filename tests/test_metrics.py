"""Metrics: a labelled child looked up once, counted where labels() would count it."""

from __future__ import annotations

import threading

from proxy.metrics import Metrics


def test_a_labelled_child_is_the_metrics_own_and_looked_up_once() -> None:
    metrics = Metrics()
    child = metrics.labelled(metrics.requests, "chat", "200", "none")
    assert child is metrics.labelled(metrics.requests, "chat", "200", "none")
    assert child is metrics.requests.labels("chat", "200", "none")
    child.inc()
    metrics.labelled(metrics.requests, "chat", "400", "none").inc(2)
    text = metrics.exposition().decode()
    assert 'compaction_proxy_requests_total{compaction="none",route="chat",status="200"} 1.0' in text
    assert 'compaction_proxy_requests_total{compaction="none",route="chat",status="400"} 2.0' in text


def test_the_same_values_on_two_metrics_are_two_children() -> None:
    metrics = Metrics()
    metrics.labelled(metrics.chat_requests, "none").inc()
    metrics.labelled(metrics.reuse_lookups, "none").inc(3)
    text = metrics.exposition().decode()
    assert 'compaction_proxy_chat_requests_total{compaction="none"} 1.0' in text
    assert 'compaction_proxy_reuse_lookups_total{result="none"} 3.0' in text


def test_a_wrong_number_of_values_is_refused_as_labels_refuses_it() -> None:
    metrics = Metrics()
    try:
        metrics.labelled(metrics.requests, "chat")
    except ValueError:
        pass
    else:
        raise AssertionError("two missing label values were accepted")
    assert not any(key[1] == ("chat",) for key in metrics._children)


def test_threads_counting_the_same_labels_lose_no_increment() -> None:
    metrics = Metrics()

    def count() -> None:
        for _ in range(2000):
            metrics.labelled(metrics.requests, "chat", "200", "none").inc()

    threads = [threading.Thread(target=count) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert 'status="200"} 8000.0' in metrics.exposition().decode()
