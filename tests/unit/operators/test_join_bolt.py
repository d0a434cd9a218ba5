"""Storm's JoinBolt as a pure hash join: join types, selectors, errors and serialisation."""

from __future__ import annotations

import json

import pytest

from stream_ops.errors import TopologyDefinitionError
from stream_ops.operators import JoinBolt
from stream_ops.topology.windows import Duration, Records, Sliding, Tumbling, WindowDef

# --- Storm's documented examples ---------------------------------------------------------


def test_storm_uuid_word_timestamp_example():
    bolt = (
        JoinBolt("spout1", "uuid")
        .join("spout2", "uuid", "spout1")
        .select("uuid, word, spout2:timestamp")
        .with_tumbling_window(count=10)
    )
    window = [
        ("spout1", {"uuid": "u1", "word": "hello", "timestamp": 1}),
        ("spout2", {"uuid": "u1", "timestamp": 100}),
        ("spout1", {"uuid": "u2", "word": "world", "timestamp": 2}),
        ("spout1", {"uuid": "u3", "word": "lonely", "timestamp": 3}),
        ("spout2", {"uuid": "u2", "timestamp": 200}),
        ("spout2", {"uuid": "u1", "timestamp": 150}),
    ]
    assert bolt.output_fields == ("uuid", "word", "spout2:timestamp")  # Storm keeps the prefix
    # Probe (spout1) order, then matches in window order; "timestamp" read from spout2 only.
    assert bolt.execute(window) == [["u1", "hello", 100], ["u1", "hello", 150], ["u2", "world", 200]]


def test_storm_four_spout_example_with_left_join():
    # select userId, key4, key2, key3 from table1
    # inner join table2 on table2.userId = table1.key1
    # inner join table3 on table3.key3 = table2.userId
    # left join table4 on table4.key4 = table3.key3
    bolt = (
        JoinBolt("spout1", "key1")
        .join("spout2", "userId", "spout1")
        .join("spout3", "key3", "spout2")
        .left_join("spout4", "key4", "spout3")
        .select("userId, key4, key2, spout3:key3")
    )
    window = [
        ("spout1", {"key1": 1, "key2": "a"}),
        ("spout1", {"key1": 2, "key2": "b"}),
        ("spout1", {"key1": 3, "key2": "c"}),
        ("spout2", {"userId": 1}),
        ("spout2", {"userId": 2}),
        ("spout3", {"key3": 1}),
        ("spout3", {"key3": 2}),
        ("spout4", {"key4": 1}),
    ]
    assert bolt.streams == ("spout1", "spout2", "spout3", "spout4")
    assert bolt.join_fields == {"spout1": "key1", "spout2": "userId", "spout3": "key3", "spout4": "key4"}
    assert bolt.execute(window) == [[1, 1, "a", 1], [2, None, "b", 2]]


# --- join types on two streams -------------------------------------------------------------

USERS_ORDERS = [
    ("users", {"id": 1, "name": "ann"}),
    ("orders", {"user_id": 1, "amount": 10}),
    ("users", {"id": 2, "name": "bob"}),
    ("orders", {"user_id": 3, "amount": 30}),
    ("users", {"name": "nokey"}),
    ("orders", {"amount": 99}),
    ("orders", {"user_id": 1, "amount": 11}),
]


def _users_orders(how: str) -> JoinBolt:
    bolt = JoinBolt("users", "id")
    getattr(bolt, how)("orders", "user_id", "users")
    return bolt.select("id, name, orders:user_id, amount")


def test_inner_join_drops_unmatched_and_keyless():
    assert _users_orders("join").execute(USERS_ORDERS) == [[1, "ann", 1, 10], [1, "ann", 1, 11]]


def test_left_join_keeps_unmatched_and_keyless_probe_records_with_nulls():
    # Storm would drop {"name": "nokey"} (null join key); SQL keeps it.
    assert _users_orders("left_join").execute(USERS_ORDERS) == [
        [1, "ann", 1, 10],
        [1, "ann", 1, 11],
        [2, "bob", None, None],
        [None, "nokey", None, None],
    ]


def test_right_join_keeps_unmatched_new_records_after_the_matches():
    assert _users_orders("right_join").execute(USERS_ORDERS) == [
        [1, "ann", 1, 10],
        [1, "ann", 1, 11],
        [None, None, 3, 30],
        [None, None, None, 99],
    ]


def test_outer_join_keeps_unmatched_from_both_sides():
    assert _users_orders("outer_join").execute(USERS_ORDERS) == [
        [1, "ann", 1, 10],
        [1, "ann", 1, 11],
        [2, "bob", None, None],
        [None, "nokey", None, None],
        [None, None, 3, 30],
        [None, None, None, 99],
    ]


def test_null_keys_never_match_each_other():
    bolt = JoinBolt("a", "k").outer_join("b", "k", "a").select("a:x, b:y")
    window = [("a", {"k": None, "x": 1}), ("b", {"k": None, "y": 2})]
    assert bolt.execute(window) == [[1, None], [None, 2]]


def test_keys_compare_by_value_and_type():
    bolt = JoinBolt("a", "k").join("b", "k", "a").select("a:x, b:y")
    window = [
        ("a", {"k": "1", "x": "str"}),
        ("a", {"k": [1, 2], "x": "list"}),
        ("a", {"k": 2, "x": "int"}),
        ("b", {"k": 1, "y": "one"}),
        ("b", {"k": [1, 2], "y": "pair"}),
        ("b", {"k": 2.0, "y": "two"}),
    ]
    assert bolt.execute(window) == [["list", "pair"], ["int", "two"]]


def test_empty_window_and_missing_streams():
    bolt = _users_orders("left_join")
    assert bolt.execute([]) == []
    assert bolt.execute([("users", {"id": 5, "name": "eve"})]) == [[5, "eve", None, None]]
    assert _users_orders("right_join").execute([("orders", {"user_id": 5, "amount": 1})]) == [[None, None, 5, 1]]


def test_single_stream_is_a_projection():
    bolt = JoinBolt("s", "k").select("k, v, missing")
    assert bolt.execute([("s", {"k": 1, "v": "x"}), ("s", {"k": 2})]) == [[1, "x", None], [2, None, None]]


# --- three streams -----------------------------------------------------------------------


def test_three_streams_joined_against_the_first():
    bolt = JoinBolt("a", "id").join("b", "a_id", "a").left_join("c", "a_ref", "a").select("id, a:v, b:v as b_v, c:v as c_v")
    window = [
        ("a", {"id": 1, "v": "a1"}),
        ("a", {"id": 2, "v": "a2"}),
        ("b", {"a_id": 1, "v": "b1"}),
        ("b", {"a_id": 2, "v": "b2"}),
        ("c", {"a_ref": 2, "v": "c2"}),
        ("c", {"a_ref": 2, "v": "c2bis"}),
    ]
    assert bolt.execute(window) == [
        [1, "a1", "b1", None],
        [2, "a2", "b2", "c2"],
        [2, "a2", "b2", "c2bis"],
    ]


def test_right_join_rows_continue_through_later_joins_by_sql_rules():
    window = [
        ("a", {"id": 1, "v": "a1"}),
        ("b", {"id": 1, "v": "b1"}),
        ("b", {"id": 2, "v": "b2"}),
        ("c", {"id": 1, "v": "c1"}),
        ("c", {"id": 2, "v": "c2"}),
    ]
    # c joined against b: the right-kept b2 row has a b record, so it matches c2.
    via_b = JoinBolt("a", "id").right_join("b", "id", "a").join("c", "id", "b").select("a:v as a_v, b:v as b_v, c:v as c_v")
    assert via_b.execute(window) == [["a1", "b1", "c1"], [None, "b2", "c2"]]
    # c joined against a: the right-kept b2 row has no a record (null key), so the inner join drops it ...
    via_a = JoinBolt("a", "id").right_join("b", "id", "a").join("c", "id", "a").select("a:v as a_v, b:v as b_v, c:v as c_v")
    assert via_a.execute(window) == [["a1", "b1", "c1"]]
    # ... and a left join keeps it with nulls, while an outer join also keeps the unmatched c2.
    left = JoinBolt("a", "id").right_join("b", "id", "a").left_join("c", "id", "a").select("a:v as a_v, b:v as b_v, c:v as c_v")
    assert left.execute(window) == [["a1", "b1", "c1"], [None, "b2", None]]
    outer = JoinBolt("a", "id").right_join("b", "id", "a").outer_join("c", "id", "a").select("a:v as a_v, b:v as b_v, c:v as c_v")
    assert outer.execute(window) == [["a1", "b1", "c1"], [None, "b2", None], [None, None, "c2"]]


# --- selectors ---------------------------------------------------------------------------


def test_nested_and_prefixed_selectors_and_nested_join_fields():
    bolt = (
        JoinBolt("users", "profile.id")
        .join("events", "meta.user", "users")
        .select("profile.name.first, events:meta.ts, profile.missing.deep, events:meta.user.nope, events:kind")
    )
    window = [
        ("users", {"profile": {"id": 7, "name": {"first": "ann"}}}),
        ("events", {"meta": {"user": 7, "ts": 123}, "kind": "click"}),
    ]
    assert bolt.output_fields == (
        "profile.name.first",
        "events:meta.ts",
        "profile.missing.deep",
        "events:meta.user.nope",
        "events:kind",
    )
    assert bolt.execute(window) == [["ann", 123, None, None, "click"]]


def test_unprefixed_field_comes_from_the_first_stream_that_has_it():
    bolt = JoinBolt("a", "k").join("b", "k", "a").select("v, a:v as a_v, b:v AS b_v")
    assert bolt.output_fields == ("v", "a_v", "b_v")
    assert bolt.execute([("a", {"k": 1, "v": "from-a"}), ("b", {"k": 1, "v": "from-b"})]) == [["from-a", "from-a", "from-b"]]
    assert bolt.execute([("a", {"k": 1, "v": None}), ("b", {"k": 1, "v": "from-b"})]) == [["from-b", None, "from-b"]]


def test_select_accepts_a_list_and_spaces():
    bolt = JoinBolt("a", "k").join("b", "k", "a").select(["  k ", " b : v "])
    assert bolt.output_fields == ("k", "b:v")
    assert [str(s) for s in bolt.selectors] == ["k", "b:v"]
    aliased = JoinBolt("a", "k").join("b", "k", "a").select("a:v as left_v, b:v as right_v")
    assert [str(s) for s in aliased.selectors] == ["a:v as left_v", "b:v as right_v"]
    assert JoinBolt.from_spec(aliased.to_spec()) == aliased


# --- errors ------------------------------------------------------------------------------


def test_stream_joined_twice_names_the_stream():
    bolt = JoinBolt("users", "id").join("orders", "user_id", "users")
    with pytest.raises(TopologyDefinitionError, match="stream 'orders' is already part of the join"):
        bolt.left_join("orders", "user_id", "users")
    with pytest.raises(TopologyDefinitionError, match="stream 'users' is already part of the join"):
        bolt.join("users", "id", "orders")


def test_prior_stream_must_be_declared_before():
    with pytest.raises(TopologyDefinitionError, match="prior stream 'spout2' .* was not declared before"):
        JoinBolt("spout1", "k1").join("spout3", "k3", "spout2")


def test_selector_naming_an_unknown_stream():
    bolt = JoinBolt("users", "id").join("orders", "user_id", "users")
    with pytest.raises(TopologyDefinitionError, match="names stream 'payments', which is not part of the join"):
        bolt.select("id, payments:amount")


def test_execute_and_to_spec_before_select():
    bolt = JoinBolt("users", "id").join("orders", "user_id", "users")
    with pytest.raises(TopologyDefinitionError, match=r"call select\(.*\) before execute\(\)"):
        bolt.execute([])
    with pytest.raises(TopologyDefinitionError, match=r"before to_spec\(\)"):
        bolt.to_spec()
    with pytest.raises(TopologyDefinitionError, match="before output_fields"):
        _ = bolt.output_fields


@pytest.mark.parametrize(
    ("select", "message"),
    [
        ("a:x, a:x", "both give output field 'a:x'"),
        ("a:x as y, y", "both give output field 'y'"),
        ("a:x as 1y", "alias '1y' .* is not a valid name"),
        ("", "names no field"),
        ("x,,y", "names no field"),
        (":x", "empty stream name"),
        ("a..b", "is not a field name"),
        ("a:b:c", "is not a field name"),
        ("a:x as", "is not a field name"),
        ("first name", "is not a field name"),
    ],
)
def test_bad_selectors(select, message):
    with pytest.raises(TopologyDefinitionError, match=message):
        JoinBolt("a", "k").join("b", "k", "a").select(select)


def test_bad_join_fields_and_stream_names():
    with pytest.raises(TopologyDefinitionError, match="has a stream prefix"):
        JoinBolt("a", "k").join("b", "a:k", "a")
    with pytest.raises(TopologyDefinitionError, match="stream name '' is invalid"):
        JoinBolt("", "k")
    with pytest.raises(TopologyDefinitionError, match="stream name 'a:b' is invalid"):
        JoinBolt("a", "k").join("a:b", "k", "a")


def test_record_of_a_stream_outside_the_join():
    bolt = JoinBolt("a", "k").join("b", "k", "a").select("k")
    with pytest.raises(TopologyDefinitionError, match="record of stream 'c' reached the JoinBolt"):
        bolt.execute([("c", {"k": 1})])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of length, count="),
        ({"count": 3, "seconds": 1.0}, "exactly one of length, count="),
        ({"count": 0}, "positive integer"),
        ({"count": 2.5}, "positive integer"),
        ({"seconds": -1}, "positive number"),
        ({"seconds": float("inf")}, "positive number"),
    ],
)
def test_bad_windows(kwargs, message):
    with pytest.raises(TopologyDefinitionError, match=message):
        JoinBolt("a", "k").with_tumbling_window(**kwargs)


def test_window_buffer_requires_a_window():
    with pytest.raises(TopologyDefinitionError, match="has no window"):
        JoinBolt("a", "k").select("k").window_buffer(now=0.0)


# --- definition and serialisation ------------------------------------------------------------


def test_builder_is_fluent_and_exposes_its_definition():
    bolt = JoinBolt("users", "id")
    assert bolt.join("orders", "user_id", "users") is bolt
    assert bolt.left_join("refunds", "user_id", "users") is bolt
    assert bolt.right_join("tags", "uid", "orders") is bolt
    assert bolt.outer_join("notes", "uid", "tags") is bolt
    assert bolt.select("id, orders:amount") is bolt
    assert bolt.with_tumbling_window(seconds=30) is bolt
    assert bolt.with_output_stream("joined") is bolt
    assert bolt.streams == ("users", "orders", "refunds", "tags", "notes")
    assert [c.how for c in bolt.clauses] == [None, "inner", "left", "right", "outer"]
    assert [c.prior for c in bolt.clauses] == [None, "users", "users", "orders", "tags"]
    assert bolt.window == WindowDef.build(Tumbling(30))
    assert bolt.output_stream == "joined"
    assert bolt.output_fields == ("id", "orders:amount")


def test_defaults():
    bolt = JoinBolt("a", "k").select("k")
    assert bolt.window is None
    assert bolt.output_stream == "default"


def test_spec_round_trip_through_json():
    bolt = (
        JoinBolt("users", "profile.id")
        .join("orders", "user_id", "users")
        .left_join("refunds", "order_id", "orders")
        .right_join("tags", "uid", "users")
        .outer_join("notes", "uid", "tags")
        .select("profile.name, orders:amount, refunds:amount_back, tags:tag, notes:text")
        .with_tumbling_window(count=100)
        .with_output_stream("joined")
    )
    spec = json.loads(json.dumps(bolt.to_spec()))
    assert spec["kind"] == "JoinBolt"
    assert spec["window"]["counted"] is True and spec["window"]["length"] == 100
    rebuilt = JoinBolt.from_spec(spec)
    assert rebuilt == bolt
    assert rebuilt.to_spec() == bolt.to_spec()
    window = [("users", {"profile": {"id": 1, "name": "ann"}}), ("orders", {"user_id": 1, "amount": 5})]
    assert rebuilt.execute(window) == bolt.execute(window)

    time_bolt = JoinBolt("a", "k").select("k").with_tumbling_window(seconds=2.5)
    assert JoinBolt.from_spec(json.loads(json.dumps(time_bolt.to_spec()))).window == WindowDef.build(Tumbling(2.5))
    without_length = {**time_bolt.to_spec(), "window": {"seconds": 2.5}}  # not a to_spec window
    with pytest.raises(TopologyDefinitionError, match="malformed JoinBolt description"):
        JoinBolt.from_spec(without_length)


def test_from_spec_rejects_bad_descriptions():
    good = JoinBolt("a", "k").join("b", "k", "a").select("k").to_spec()
    with pytest.raises(TopologyDefinitionError, match="not a JoinBolt description"):
        JoinBolt.from_spec({**good, "kind": "Sum"})
    bad_how = {**good, "streams": [good["streams"][0], {**good["streams"][1], "how": "cross"}]}
    with pytest.raises(TopologyDefinitionError, match="unknown join type 'cross'"):
        JoinBolt.from_spec(bad_how)
    twice = {**good, "streams": [good["streams"][0], good["streams"][1], good["streams"][1]]}
    with pytest.raises(TopologyDefinitionError, match="stream 'b' is already part of the join"):
        JoinBolt.from_spec(twice)
    with pytest.raises(TopologyDefinitionError, match="malformed JoinBolt description"):
        JoinBolt.from_spec({"kind": "JoinBolt", "streams": []})


# --- Storm parity: windows, names, keys, nulls -----------------------------------------------


def test_storm_window_builders_on_the_window_model():
    sliding = JoinBolt("a", "k").select("k").with_window(Duration.seconds(10), Duration.of(5000))
    assert sliding.window == WindowDef.build(Sliding(10, 5))
    counted = JoinBolt("a", "k").select("k").with_window(Records.of(6), Records.of(2))
    assert counted.window == WindowDef.build(Sliding(Records.of(6), Records.of(2)))
    assert JoinBolt("a", "k").select("k").with_tumbling_window(Records.of(3)).window == WindowDef.build(Tumbling(Records(3)))
    event = (
        JoinBolt("a", "k")
        .select("k")
        .with_window(60)
        .with_timestamp_field("ts", unit="ms")
        .with_lag(Duration.seconds(5))
        .with_watermark_interval(2)
        .with_late_tuple_stream("late")
    )
    assert event.window == WindowDef.build(
        Tumbling(60), time="event", timestamp_field="ts", timestamp_unit="ms", lag=5, late_stream="late"
    )
    assert event.tick_interval_s == 2
    assert JoinBolt.from_spec(json.loads(json.dumps(event.to_spec()))) == event


def test_window_settings_that_do_not_fit_fail_with_the_reason():
    with pytest.raises(TopologyDefinitionError, match="both be durations"):
        JoinBolt("a", "k").with_window(10, Records.of(2))
    with pytest.raises(TopologyDefinitionError, match="need with_timestamp_field"):
        _ = JoinBolt("a", "k").select("k").with_window(10).with_lag(3).window
    with pytest.raises(TopologyDefinitionError, match="event time needs a duration window"):
        _ = JoinBolt("a", "k").select("k").with_window(Records.of(5)).with_timestamp_field("ts").window
    with pytest.raises(TopologyDefinitionError, match="takes a duration"):
        JoinBolt("a", "k").with_lag(Records.of(2))


def test_storm_output_names_keep_the_stream_prefix():
    bolt = JoinBolt("users", "id").join("stores", "city_id", "users").select("users:city, stores:city")
    assert bolt.output_fields == ("users:city", "stores:city")
    window = [("users", {"id": 1, "city": "Oslo"}), ("stores", {"city_id": 1, "city": "Bergen"})]
    assert bolt.execute(window) == [["Oslo", "Bergen"]]


def test_keys_equal_as_json_values_meet_and_booleans_stay_apart():
    bolt = JoinBolt("a", "k").join("b", "k", "a").select("a:v, b:v")
    window = [("a", {"k": 1, "v": "int"}), ("a", {"k": True, "v": "bool"}), ("b", {"k": 1.0, "v": "float"})]
    assert bolt.execute(window) == [["int", "float"]]


def test_storm_drops_a_left_join_row_without_a_prior_key_sql_keeps_it():
    window = [("a", {"k": None, "v": "no key"}), ("a", {"k": 1, "v": "keyed"})]
    sql = JoinBolt("a", "k").left_join("b", "k", "a").select("a:v, b:v")
    storm = JoinBolt("a", "k", null_keys="drop").left_join("b", "k", "a").select("a:v, b:v")
    assert sql.execute(window) == [["no key", None], ["keyed", None]]
    assert storm.execute(window) == [["keyed", None]]
    assert JoinBolt.from_spec(storm.to_spec()) == storm
    with pytest.raises(TopologyDefinitionError, match="null_keys"):
        JoinBolt("a", "k", null_keys="storm")  # type: ignore[arg-type]
