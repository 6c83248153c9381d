import sys

from mmfragile.cli import main

sys.exit(main())
