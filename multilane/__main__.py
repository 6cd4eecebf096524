"""``python -m multilane`` runs the console script."""

from multilane.cli import main

raise SystemExit(main())
