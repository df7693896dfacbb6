from iac.cli.main import main

raise SystemExit(main())
