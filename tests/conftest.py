import os
import sys
from pathlib import Path

import pytest
import torch

# tiny_models.py and score_script.py live next to the tests.
sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Tiny models gain nothing from threads, and on a 2-core machine shared with other work, thread
# wake-ups dominate their run time.
torch.set_num_threads(1)


@pytest.fixture
def data_dir() -> Path:
    from gdr.data import data_dir as _d

    return _d()
