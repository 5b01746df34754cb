"""Next-token sampling for a batch of rows, each with its own temperature, top-p and generator.

For row i with logits z (float32):

* log pi(v) = log_softmax(z)_v is returned for the chosen token: the policy's own probability at
  temperature 1 without top-p, the quantity the learner recomputes (vLLM's ``raw_logprobs``).
* greedy rows (temperature < 1e-5, vLLM's threshold) take argmax z;
* other rows sample from p = softmax(z / T), restricted to the nucleus: the most probable tokens
  whose cumulative mass *before* them is below top_p (so the top token is always kept)
  [Holtzman et al. 2019]. The draw is by inverse CDF with one uniform u ~ U[0, 1) from the row's
  own ``torch.Generator``, so a seeded row is reproducible whatever else shares its batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

GREEDY_EPS = 1e-5


def sample_tokens(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    generators: Sequence[torch.Generator],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row of ``logits`` [B, V]; return (token ids [B], log pi(token) [B]).

    ``temperature`` and ``top_p`` [B] are on the logits' device; ``generators`` are CPU generators.
    """
    logits = logits.float()
    logprobs = torch.log_softmax(logits, dim=-1)
    tokens = logits.argmax(dim=-1)
    sampled = (temperature >= GREEDY_EPS).nonzero().squeeze(1)
    if sampled.numel():
        z = logits[sampled] / temperature[sampled, None]
        probs = torch.softmax(z, dim=-1)
        p = top_p[sampled]
        if bool((p < 1.0).any()):
            probs, order = probs.sort(dim=-1, descending=True)
            mass_before = probs.cumsum(dim=-1) - probs
            probs = probs.masked_fill(mass_before >= p[:, None], 0.0)
        else:
            order = None
        cdf = probs.cumsum(dim=-1)
        # The generators live on the CPU (cheap per-row state); only the B uniforms move to the logits' device.
        u = torch.stack([torch.rand((), generator=generators[i]) for i in sampled.tolist()]).to(logits.device)
        # right=True: the first index whose cdf exceeds u * total never lands on a zero-probability token.
        choice = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).clamp_(max=cdf.shape[-1] - 1)
        picked = order.gather(1, choice) if order is not None else choice
        tokens[sampled] = picked.squeeze(1)
    return tokens, logprobs.gather(1, tokens[:, None]).squeeze(1)
