import sys

from gdr.cli import main

sys.exit(main())
