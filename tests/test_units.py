"""The one unit parser: human strings to SI base units; bits never silently taken for bytes."""

from __future__ import annotations

import pytest

from shoal.units import UnitError, parse_bandwidth, parse_bytes, parse_flops, parse_seconds


@pytest.mark.parametrize(("text", "expected"), [
    ("40GB", 40e9),
    ("80GiB", 80 * 2**30),
    ("512MB", 512e6),
    ("1.5TB", 1.5e12),
    ("16 KiB", 16 * 1024),
    ("100B", 100.0),
    (1234, 1234.0),
    ("7", 7.0),
])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == pytest.approx(expected)


@pytest.mark.parametrize(("text", "expected"), [
    ("50ms", 0.05),
    ("2.5s", 2.5),
    ("10us", 1e-5),
    ("3h", 10800.0),
    ("2min", 120.0),
    (0.25, 0.25),
])
def test_parse_seconds(text, expected):
    assert parse_seconds(text) == pytest.approx(expected)


@pytest.mark.parametrize(("text", "expected"), [
    ("10Gbps", 1.25e9),  # bits per second
    ("10Gbit/s", 1.25e9),
    ("100Mbps", 12.5e6),
    ("25GB/s", 25e9),  # bytes per second
    ("25GBps", 25e9),
    ("1GiB/s", 2**30),
    (3e9, 3e9),
])
def test_parse_bandwidth(text, expected):
    assert parse_bandwidth(text) == pytest.approx(expected)


def test_bits_and_bytes_differ_by_eight():
    assert parse_bandwidth("8Gbps") == pytest.approx(parse_bandwidth("1GB/s"))


@pytest.mark.parametrize(("text", "expected"), [
    ("312TFLOPS", 312e12),
    ("989.4TFLOPS", 989.4e12),
    ("1.2PFLOPS", 1.2e15),
    ("19.5TFLOP/s", 19.5e12),
    (1e14, 1e14),
])
def test_parse_flops(text, expected):
    assert parse_flops(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["40Gb", "8Mb", "1Tb"])
def test_bits_rejected_for_sizes(text):
    with pytest.raises(UnitError, match="bits"):
        parse_bytes(text)


@pytest.mark.parametrize(("fn", "text", "example"), [
    (parse_bytes, "forty gigabytes", "40GB"),
    (parse_bytes, "40XB", "40GB"),
    (parse_bytes, "10Gbps", "40GB"),
    (parse_seconds, "50 parsecs", "50ms"),
    (parse_seconds, "5ms5", "50ms"),
    (parse_bandwidth, "10 furlongs", "10Gbps"),
    (parse_bandwidth, "10GB", "10Gbps"),  # a size is not a bandwidth
    (parse_flops, "312 TOPS", "312TFLOPS"),
    (parse_flops, "fast", "312TFLOPS"),
])
def test_bad_strings_name_an_example(fn, text, example):
    with pytest.raises(UnitError) as ei:
        fn(text)
    assert example in str(ei.value)


@pytest.mark.parametrize("fn", [parse_bytes, parse_seconds, parse_bandwidth, parse_flops])
def test_booleans_and_other_types_rejected(fn):
    with pytest.raises(UnitError):
        fn(True)
    with pytest.raises(UnitError):
        fn([1])


def test_unit_error_is_a_value_error():
    assert issubclass(UnitError, ValueError)


@pytest.mark.parametrize("fn", [parse_bytes, parse_seconds, parse_bandwidth, parse_flops])
@pytest.mark.parametrize("value", [float("inf"), float("nan"), "1e400", "inf", "-inf"])
def test_values_that_are_not_finite_rejected(fn, value):
    with pytest.raises(UnitError):
        fn(value)
