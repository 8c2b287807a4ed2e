"""BatchRunner: what the API needs from whatever runs its batches.

The API only writes records and markers in the store (the truth) and nudges the runner; the runner
(jobs/api/supervisor.py's batch process, embedded or on a fleet) does the rest. The `freight serve`
command chooses and builds it: the API never imports the code that runs models.
"""

from __future__ import annotations

from typing import Protocol


class BatchRunner(Protocol):
    def start(self) -> None:
        """Begin running batches (the server starts)."""

    def stop(self) -> None:
        """Stop, leaving every unfinished batch to resume at the next start (the server stops)."""

    def nudge(self) -> None:
        """A batch was created or cancelled: look at the store now rather than at the next poll."""
