import sys

from .cli import main

if __name__ == "__main__":  # spawned worker processes import this module too; they must not run the CLI
    sys.exit(main())
