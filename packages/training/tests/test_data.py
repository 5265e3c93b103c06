import numpy as np
import pytest

from onemodel.tensors import Generator, OneModelError
from onemodel.training import DataLoader


def test_batches_cover_the_data_and_shuffle_reproducibly():
    x = np.arange(10)
    y = np.arange(10) * 2
    loader = DataLoader(x, y, batch_size=4, shuffle=True, generator=Generator(3))
    batches = list(loader)
    assert len(loader) == 3 and [len(b[0]) for b in batches] == [4, 4, 2]
    seen = np.concatenate([b[0].numpy() for b in batches])
    assert sorted(seen.tolist()) == list(range(10)) and seen.tolist() != list(range(10))
    assert all((b[1].numpy() == b[0].numpy() * 2).all() for b in batches)
    again = [b[0].tolist() for b in DataLoader(x, y, batch_size=4, shuffle=True,
                                               generator=Generator(3))]
    assert again == [b[0].tolist() for b in batches]
    assert len(DataLoader(x, batch_size=4, drop_last=True)) == 2


def test_mismatched_lengths_are_an_error():
    with pytest.raises(OneModelError, match="same length, got 3, 2"):
        DataLoader(np.zeros(3), np.zeros(2))
