"""Tiny models that follow the zoo contract, for hand-checkable engine/algorithm tests."""

import flax.linen as nn


class TinyLinear(nn.Module):
  """features = flattened input, logits = Dense "head" (no BatchNorm, no dropout)."""
  num_classes: int = 3
  input_dim: int = 32 * 32 * 3

  @property
  def feature_dim(self):
    return self.input_dim

  @nn.compact
  def __call__(self, x, *, train, mask=None):
    del train, mask
    h = x.reshape((x.shape[0], -1))
    return h, nn.Dense(self.num_classes, name="head")(h)


class TinyBatchNorm(nn.Module):
  """Dense -> BatchNorm -> head, to exercise batch statistics and masks."""
  num_classes: int = 3

  @property
  def feature_dim(self):
    return 4

  @nn.compact
  def __call__(self, x, *, train, mask=None):
    h = nn.Dense(4)(x.reshape((x.shape[0], -1)))
    bn_mask = None if mask is None else mask[:, None]
    h = nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5)(h, mask=bn_mask)
    return h, nn.Dense(self.num_classes, name="head")(nn.relu(h))


class TinyMLP(nn.Module):
  """features = Dense "body" of the flattened input (they depend on the parameters)."""
  num_classes: int = 3

  @property
  def feature_dim(self):
    return 4

  @nn.compact
  def __call__(self, x, *, train, mask=None):
    del train, mask
    h = nn.Dense(4, name="body")(x.reshape((x.shape[0], -1)))
    return h, nn.Dense(self.num_classes, name="head")(h)
