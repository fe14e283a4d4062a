import sys

from oceanus.cli import main

sys.exit(main())
