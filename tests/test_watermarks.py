"""KafkaMetadata.watermarks_many against the dev broker: the cluster-wide topic list is asked for at most
every PARTITIONS_MAX_AGE_S, while a topic created or deleted in between is seen at the next call."""

from __future__ import annotations

from devtools.demo.data import produce
from kafka_iceberg.kafka.admin import PARTITIONS_MAX_AGE_S, KafkaMetadata


def test_watermarks_of_many_topics_list_the_cluster_once_and_still_see_topics_come_and_go(
    kafka_config, unique, topic_factory
):
    meta = KafkaMetadata(kafka_config)
    lists = []
    list_topics = meta.admin.list_topics
    meta.admin.list_topics = lambda *a, **k: lists.append(a) or list_topics(*a, **k)  # counts the real calls

    first = topic_factory(f"{unique}_a", partitions=2)
    produce(kafka_config, first, [(b"k", b"v", 1_700_000_000_000)] * 3)
    missing = f"events.{unique}_missing"
    marks = meta.watermarks_many([first, missing])
    assert marks[missing] is None
    assert sum(w.high - w.low for w in marks[first].values()) == 3
    assert len(lists) == 1

    second = topic_factory(f"{unique}_b", partitions=3)  # created after the list: described at the next call
    marks = meta.watermarks_many([first, second, missing])
    assert sorted(marks[second]) == [0, 1, 2] and marks[missing] is None
    assert len(lists) == 1, "a list younger than PARTITIONS_MAX_AGE_S is not asked for again"

    for future in meta.admin.delete_topics([second], operation_timeout=30).values():
        future.result(30)
    marks = meta.watermarks_many([first, second])  # the listed topic is gone: listed again, not an error
    assert marks[second] is None and sum(w.high for w in marks[first].values()) == 3
    assert len(lists) == 2

    meta._listed_at -= PARTITIONS_MAX_AGE_S + 1  # the list ages past its bound
    meta.watermarks_many([first])
    assert len(lists) == 3
