"""``stream-dp`` with the audit's doctoring named by ``STREAM_DP_AUDIT_DOCTOR`` installed first.

``python -m tests.audit.doctored_worker run --config FILE`` is what the audit starts in place of
``stream-dp run`` when that variable is set (see ``tests/audit/doctor.py``): the only way a worker
process gets doctored.
"""

from __future__ import annotations

import sys

import pytest

from tests.audit.doctor import ENV, from_environment, install


def main() -> int:
    doctoring = from_environment()
    if doctoring is None:
        print(f"{ENV} is not set: run stream-dp itself for an undoctored worker", file=sys.stderr)
        return 2
    install(doctoring, pytest.MonkeyPatch())  # never undone: the process is the doctored build
    print(f"doctored build: {doctoring}", file=sys.stderr)

    from stream_dp.cli.main import main as stream_dp

    return stream_dp()


if __name__ == "__main__":
    sys.exit(main())
