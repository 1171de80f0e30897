"""What reading YAML can raise. yaml.YAMLError is not all: PyYAML's safe constructors hand scalars to int(),
float(), datetime and dict lookups and let their errors through ("2001-02-30", "!!int x", "!!bool maybe", an
integer of 4300+ digits), and nesting deeper than the recursion limit is a RecursionError. A reader of a file
it does not control catches all of them, as it catches yaml.YAMLError."""

from __future__ import annotations

from typing import Final

import yaml

YAML_ERRORS: Final = (yaml.YAMLError, ValueError, KeyError, TypeError, OverflowError, RecursionError)
