import sys

from ..cli.translate import main

if __name__ == "__main__":
    sys.exit(main())
