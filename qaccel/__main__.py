import sys

from qaccel.cli import main

sys.exit(main())
