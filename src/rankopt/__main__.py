import sys

from rankopt.cli import console_main

sys.exit(console_main())
