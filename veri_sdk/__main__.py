import sys

from veri_sdk.cli import main

sys.exit(main())
