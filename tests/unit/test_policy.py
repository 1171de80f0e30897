from pathlib import Path
from typing import Any

import pytest
import yaml

from rmd_agent.errors import ConfigError
from rmd_agent.plan.policy import (
    BUILTIN_POLICIES,
    Policy,
    PolicyBook,
    parse_policies,
    platform_for_cpu,
    platform_from_cpuinfo,
)
from rmd_agent.settings import load_policy_file


def ways(policy: Policy) -> tuple[int, int]:
    return policy.cache_max, policy.cache_min


def test_builtin_values_follow_rmd_per_platform() -> None:
    book = PolicyBook()
    assert {n: ways(p) for n, p in book.for_platform("skylake").items()} == {
        "gold": (4, 4),
        "silver": (3, 1),
        "bronze": (0, 0),
    }
    assert {n: ways(p) for n, p in book.for_platform("broadwell").items()} == {
        "gold": (2, 2),
        "silver": (2, 1),
        "bronze": (0, 0),
    }


@pytest.mark.parametrize("platform", [None, "", "icelake", "zen4"])
def test_unknown_platform_gets_the_default_section_not_an_error(platform: str | None) -> None:
    table = PolicyBook().for_platform(platform)
    assert table is BUILTIN_POLICIES["default"]
    assert set(table) == {"gold", "silver", "bronze"}


def test_file_overrides_one_policy_and_keeps_the_rest() -> None:
    book = parse_policies(
        yaml.safe_load(
            """
            skylake:
              gold: {cache: {max: 6, min: 6}, mba: {percentage: 70}, pstate: {ratio: 2.5, monitoring: on}}
            """
        )
    )
    gold = book.for_platform("skylake")["gold"]
    assert (
        gold.cache_max,
        gold.cache_min,
        gold.mba_percentage,
        gold.pstate_ratio,
        gold.pstate_monitoring,
    ) == (
        6,
        6,
        70,
        2.5,
        "on",  # YAML 1.1 reads bare `on` as true; the loader gives it back as "on"
    )
    assert ways(book.for_platform("skylake")["silver"]) == (3, 1)
    assert ways(book.for_platform("broadwell")["gold"]) == (2, 2)


def test_new_platform_section_starts_from_the_default_section() -> None:
    book = parse_policies(
        {
            "default": {"silver": {"cache": {"max": 5, "min": 2}}},
            "icelake": {"gold": {"cache": {"max": 5, "min": 5}}},
        }
    )
    icelake = book.for_platform("icelake")
    assert ways(icelake["gold"]) == (5, 5)
    assert ways(icelake["silver"]) == (5, 2)  # from this file's default section
    assert ways(icelake["bronze"]) == (0, 0)


def test_rmd_policy_yaml_shape_is_accepted() -> None:
    # RMD's etc/rmd/policy.yaml: lists of one-key maps, and "Min:" capitalised (viper lower-cases keys).
    text = """
    broadwell:
      - gold:
        - cache:
            max: 3
            min: 3
      - silver:
        - cache:
            max: 3
            Min: 2
    """
    book = parse_policies(yaml.safe_load(text))
    assert ways(book.for_platform("broadwell")["gold"]) == (3, 3)
    assert ways(book.for_platform("broadwell")["silver"]) == (3, 2)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([1, 2], "must be a mapping"),
        ({"skylake": None}, "platform 'skylake' has no policies"),
        ({"skylake": {"gold": {"cache": {"max": 4, "min": 4}, "mbaa": {}}}}, "unknown key 'mbaa'"),
        ({"skylake": {"gold": {"mba": {"percentage": 50}}}}, "skylake.gold: a policy needs cache"),
        ({"skylake": {"gold": {"cache": {"max": 4}}}}, "needs both max and min"),
        (
            {"skylake": {"gold": {"cache": {"max": "4", "min": 4}}}},
            "cache.max must be an integer within 0..32, not '4'",
        ),
        (
            {"skylake": {"gold": {"cache": {"max": True, "min": 1}}}},
            "must be an integer within 0..32, not True",
        ),
        ({"skylake": {"gold": {"cache": {"max": 4, "min": 0}}}}, "max=4 min=0 is not a pool"),
        ({"skylake": {"gold": {"cache": {"max": 2, "min": 3}}}}, "max=2 min=3 is not a pool"),
        ({"skylake": {"gold": {"cache": {"max": 33, "min": 33}}}}, "within 0..32, not 33"),
        (
            {"skylake": {"silver": {"cache": {"max": 3, "min": 1}, "mba": {"percentage": 50}}}},
            "mba needs guaranteed cache (max == min > 0), not max=3 min=1",
        ),
        (
            {"skylake": {"gold": {"cache": {"max": 2, "min": 2}, "mba": {"percentage": 50, "mbps": 9}}}},
            "exactly one of percentage or mbps",
        ),
        (
            {"skylake": {"gold": {"cache": {"max": 2, "min": 2}, "mba": {"percentage": 0}}}},
            "within 1..100, not 0",
        ),
        (
            {"skylake": {"gold": {"cache": {"max": 2, "min": 2}, "pstate": {"ratio": "fast"}}}},
            "pstate.ratio must be a decimal number greater than 0 and less than 100",
        ),
        (
            {"skylake": {"gold": {"cache": {"max": 2, "min": 2}, "pstate": {"ratio": -1}}}},
            "greater than 0 and less than 100",
        ),
        (
            {"skylake": {"gold": {"cache": {"max": 2, "min": 2}, "pstate": {"ratio": 100}}}},
            "skylake.gold.pstate.ratio must be a decimal number greater than 0 and less than 100",
        ),
        (
            {"skylake": {"gold": {"cache": {"max": 2, "min": 2}, "mba": {"mbps": 4294967291}}}},
            "within 1..4294967290, not 4294967291",
        ),
        (
            {"skylake": {"gold": {"cache": {"max": 2, "min": 2}, "pstate": {"monitoring": "maybe"}}}},
            'must be "on" or "off"',
        ),
        ({"skylake": [{"gold": {"cache": {"max": 2, "min": 2}}}, {"gold": {}}]}, "'gold' is given twice"),
    ],
)
def test_bad_documents_name_the_path_and_the_problem(doc: Any, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_policies(doc, source="policy.yaml")
    assert message in str(err.value)
    assert str(err.value).startswith("policy.yaml")


def test_load_policy_file(tmp_path: Path) -> None:
    assert load_policy_file(None).for_platform("skylake")["gold"].cache_max == 4
    path = tmp_path / "policy.yaml"
    path.write_text("default:\n  gold: {cache: {max: 3, min: 3}}\n")
    assert load_policy_file(path).for_platform(None)["gold"].cache_max == 3
    path.write_text("")
    assert load_policy_file(path).for_platform("skylake")["gold"].cache_max == 4  # empty file: built-ins


def test_load_policy_file_errors_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"policy file .*missing\.yaml"):
        load_policy_file(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("default: [unclosed\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_policy_file(bad)


@pytest.mark.parametrize(
    ("vendor", "family", "model", "platform"),
    [
        ("GenuineIntel", 6, 79, "broadwell"),
        ("GenuineIntel", 6, 61, "broadwell"),
        ("GenuineIntel", 6, 85, "skylake"),  # Skylake-SP and Cascade Lake share the model number
        ("GenuineIntel", 6, 94, "skylake"),
        ("GenuineIntel", 6, 158, "kabylake"),
        ("GenuineIntel", 6, 143, None),  # Sapphire Rapids: not an RMD platform, default policies apply
        ("AuthenticAMD", 25, 1, None),
        ("GenuineIntel", 15, 85, None),
    ],
)
def test_platform_for_cpu(vendor: str, family: int, model: int, platform: str | None) -> None:
    assert platform_for_cpu(vendor, family, model) == platform


def test_platform_from_cpuinfo_reads_the_first_processor() -> None:
    cpuinfo = (
        "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 85\n"
        "model name\t: Intel(R) Xeon(R) Gold 6242 CPU @ 2.80GHz\n\n"
        "processor\t: 1\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 79\n"
    )
    assert platform_from_cpuinfo(cpuinfo) == "skylake"
    assert platform_from_cpuinfo("processor\t: 0\nvendor_id\t: GenuineIntel\n") is None
    assert platform_from_cpuinfo("") is None
