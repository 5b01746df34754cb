"""Next-token sampling for a batch of rows, each with its own temperature, top-p and generator.

For row i with logits z (float32):

* greedy rows (temperature < 1e-5, vLLM's threshold) take argmax z;
* other rows sample from the nucleus distribution

      p_{T,P}(v) = softmax(z / T)_v * [v in N] / sum_{u in N} softmax(z / T)_u,

  N the most probable tokens whose cumulative mass *before* them is below top_p P (so the top token is
  always kept) [Holtzman et al. 2019]. The draw is by inverse CDF with one uniform u ~ U[0, 1) from the
  row's own ``torch.Generator``, so a seeded row is reproducible whatever else shares its batch.

The returned log-probability is that of the drawn token under the distribution it was drawn from, the
behaviour policy mu of an importance-corrected update (vLLM's ``processed_logprobs``):

* sampled rows: log mu(y) = log p_{T,P}(y) = log_softmax(z / T)_y - logsumexp_{u in N} log_softmax(z / T)_u
  (with P = 1 the nucleus is the whole vocabulary and this is log_softmax(z / T)_y);
* greedy rows: mu is the point mass on argmax z, so log mu(y) = log 1 = 0.

It is not the learner's log pi_T(y) = log_softmax(z / T)_y when P < 1: inside the nucleus
log mu(y) = log pi_T(y) - log pi_T(N) >= log pi_T(y).
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
    """Pick one token per row of ``logits`` [B, V]; return (token ids [B], log mu(token) [B]).

    mu is the row's sampling distribution (module docstring): 0 for greedy rows.
    ``temperature`` and ``top_p`` [B] are on the logits' device; ``generators`` are CPU generators.
    """
    logits = logits.float()
    tokens = logits.argmax(dim=-1)
    behaviour = torch.zeros(logits.shape[0], dtype=torch.float32, device=logits.device)
    sampled = (temperature >= GREEDY_EPS).nonzero().squeeze(1)
    if sampled.numel():
        z = logits[sampled] / temperature[sampled, None]
        probs = torch.softmax(z, dim=-1)  # the draw uses exactly these probabilities (unchanged by the log-probs)
        log_probs = torch.log_softmax(z, dim=-1)
        p = top_p[sampled]
        if bool((p < 1.0).any()):
            probs, order = probs.sort(dim=-1, descending=True)
            cut = (probs.cumsum(dim=-1) - probs) >= p[:, None]
            probs = probs.masked_fill(cut, 0.0)
            # log pi_T(N): the nucleus' mass, from the sorted log-probs of the kept tokens.
            nucleus_log_mass = torch.logsumexp(log_probs.gather(1, order).masked_fill(cut, float("-inf")), dim=-1)
        else:
            order, nucleus_log_mass = None, torch.zeros_like(p)
        cdf = probs.cumsum(dim=-1)
        # The generators live on the CPU (cheap per-row state); only the B uniforms move to the logits' device.
        u = torch.stack([torch.rand((), generator=generators[i]) for i in sampled.tolist()]).to(logits.device)
        # right=True: the first index whose cdf exceeds u * total never lands on a zero-probability token.
        choice = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).clamp_(max=cdf.shape[-1] - 1)
        picked = order.gather(1, choice) if order is not None else choice
        tokens[sampled] = picked.squeeze(1)
        behaviour[sampled] = log_probs.gather(1, picked).squeeze(1) - nucleus_log_mass
    return tokens, behaviour
