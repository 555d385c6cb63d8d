import sys

from qaccel.app.cli import main

sys.exit(main())
