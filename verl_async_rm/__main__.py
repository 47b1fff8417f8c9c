from verl_async_rm.cli import main
import sys
sys.exit(main())
