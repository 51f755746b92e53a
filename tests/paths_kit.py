"""Where the repository and its tests are, for a test in any folder under tests/.

Tests live in folders by layer (``tests/<layer>/``), so a test's own ``__file__`` says
nothing reliable about the repository's root; this kit, at the top of tests/, does.
"""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
