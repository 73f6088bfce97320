import sys

from zoo.cli.main import main

sys.exit(main())
