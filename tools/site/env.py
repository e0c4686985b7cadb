"""Where the checkout is, and the environment variable that names the audit a build renders."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# A report.json to render instead of running the suite (``skip`` leaves the reference audit out).
AUDIT_ENV = "RLCONFORM_AUDIT_REPORT"
