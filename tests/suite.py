"""How long a test run is: the default suite, or the full one with ``STREAM_DP_FULL_TESTS=1``.

The default suite (``bash deploy/test.sh``, CI) runs every kind of test with the
sample sizes and fault runs that fit in its time; the full suite adds what only
a long run affords (``tests/conftest.py`` lists it). Tests marked ``full`` are
skipped in the default suite, with a reason that names the flag.
"""

from __future__ import annotations

import os

FULL_TESTS_ENV = "STREAM_DP_FULL_TESTS"
FULL = os.environ.get(FULL_TESTS_ENV, "").strip().lower() not in ("", "0", "false", "no")
