"""`python -m pipeline.stages.quantizer`: the modelopt driver (see the package doc)."""

import sys

from pipeline.stages.quantizer.run import main

sys.exit(main())
