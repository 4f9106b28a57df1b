import sys

try:
    from .cli import main
except KeyboardInterrupt:  # Ctrl-C while the package is still importing
    sys.exit(130)

sys.exit(main())
