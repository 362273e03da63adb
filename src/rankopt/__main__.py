import sys

from rankopt.cli import main

sys.exit(main())
