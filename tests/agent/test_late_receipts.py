"""Late work is delayed, not lost: a refusal arriving rounds later is still credited back."""

from __future__ import annotations

import torch

from skyfed.agent.config import AgentConfig
from skyfed.agent.launch import _trainer
from skyfed.agent.site import Site


def test_refusal_arriving_three_rounds_late_is_credited_back(pki):
    config = AgentConfig(cloud="aws", coordinator="localhost:1", certs=pki.directory)
    site = Site(_trainer(config), sender=config.name)
    site.train()
    site.contribution(0, "fp32")
    sent = [t.clone() for t in site.uplink.sent(0) if t is not None]
    zeros = [torch.zeros(t.shape) for t in site.spec]
    for later in (1, 2, 3):  # the receipt sits behind three rounds' broadcasts
        site.apply(later, [b""] * len(zeros), zeros)
    site.refused(0)
    residuals = site.uplink.feedback.residuals
    credited = [residuals[key] for key in site.uplink.keys if key in residuals]
    assert len(credited) == len(sent)
    for got, want in zip(credited, sent, strict=True):
        torch.testing.assert_close(got, want)
