"""tools/prebuild.py's variant arguments (the builds themselves need NVRTC: tests/test_device_build.py)."""
from __future__ import annotations

import pytest

from tools.prebuild import specs_of


def test_variants_name_their_defines_and_traced_builds() -> None:
    assert specs_of([], False) == [(False, ())]
    assert specs_of(["base", "GVM_EXP_LPT=1+groups=4", "trace:GVM_EXP_LPT=3"], True) == [
        (False, ()), (False, (("GVM_EXP_LPT", "1"), ("groups", "4"))), (True, (("GVM_EXP_LPT", "3"),)), (True, ())]
    assert specs_of(["trace:base"], True) == [(True, ())]  # the traced default once


def test_a_define_without_a_value_is_refused() -> None:
    with pytest.raises(SystemExit, match="MACRO=value"):
        specs_of(["GVM_EXP_LPT"], False)


def test_variant_specs_parse_to_defines() -> None:
    from tools.variants import parse_define_flags, parse_defines, parse_variant

    assert parse_variant("early:GVM_A=1+GVM_B=x") == ("early", (("GVM_A", "1"), ("GVM_B", "x")))
    assert parse_variant("base:") == ("base", ()) and parse_defines("") == ()
    with pytest.raises(ValueError, match="'=2' is not MACRO=value"):
        parse_defines("GVM_A=1+=2")
    assert parse_define_flags(["GVM_A=1+GVM_B=2", "GVM_C=3"]) == (("GVM_A", "1"), ("GVM_B", "2"), ("GVM_C", "3"))
    with pytest.raises(ValueError, match="'GVM_C' is not MACRO=value"):
        parse_define_flags(["GVM_A=1", "GVM_C"])
