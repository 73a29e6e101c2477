"""Chi-square goodness of fit without scipy (torch's regularised incomplete gamma)."""

from __future__ import annotations

import torch


def chi_square_p(
    observed: torch.Tensor, expected_probs: torch.Tensor, min_expected: float = 5.0
) -> float:
    """p-value that ``observed`` counts come from ``expected_probs``.

    Rare categories (expected count under ``min_expected``) are pooled into one, as usual.
    """
    observed = observed.double()
    expected = expected_probs.double() / expected_probs.sum() * observed.sum()
    big = expected >= min_expected
    obs = torch.cat([observed[big], observed[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = ((obs - exp) ** 2 / exp).sum()
    dof = obs.numel() - 1
    if dof == 0:  # one category holds all the mass: nothing to test, the counts agree
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0), stat / 2.0))
