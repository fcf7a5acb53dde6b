"""``python -m server serve ...`` is the same as ``trireme serve ...``."""
import sys

from server.cli import main

sys.exit(main())
