from kestrel_lab.cli import main

raise SystemExit(main())
