import sys

from retainz.cli import main

sys.exit(main())
