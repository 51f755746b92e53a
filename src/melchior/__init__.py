"""melchior: agents naming, finding, reaching and refusing each other.

The package is layered so that dependencies only point downward: ``wire`` and
``names`` know nothing of sessions, ``policy`` is pure, ``session`` knows nothing
of any harness, and ``mellan`` (the relay) sits beside them on the same envelope.
"""

__version__ = "0.1.0"
