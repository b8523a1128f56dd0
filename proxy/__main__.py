"""`python -m proxy` is the same program as `compaction-proxy`."""

from proxy.cli import main

raise SystemExit(main())
