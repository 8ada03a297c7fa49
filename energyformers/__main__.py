from energyformers.training.cli import main

raise SystemExit(main())
