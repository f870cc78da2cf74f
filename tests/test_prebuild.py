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
