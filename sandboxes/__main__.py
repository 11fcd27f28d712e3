import sys

from sandboxes.cli import main

sys.exit(main(sys.argv[1:]))
