import sys
from pathlib import Path

# the shared graph builders (runtime_graphs.py) import as a plain module
sys.path.insert(0, str(Path(__file__).parent))
