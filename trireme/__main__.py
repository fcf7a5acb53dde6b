"""``python -m trireme serve ...`` is the same as ``trireme serve ...``."""
import sys

from trireme.server.cli import main

sys.exit(main())
