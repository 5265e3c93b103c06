"""A short tour of onemodel.tensors: tensors, ops and autograd.

Fits y = 2x + 1 with plain tensors and gradient descent, then checks the gradient of a small
expression against finite differences. (The spec's recipe replaces this demo once tracing lands.)
"""

from onemodel.tensors import DType, Generator, Tensor, no_grad

x = Tensor.from_data([0, 1, 2, 3], 4, 1, dtype=DType.F32)
y = Tensor.from_data([1, 3, 5, 7], 4, 1, dtype=DType.F32)
g = Generator(42)
w = Tensor.randn(1, 1, generator=g).requires_grad_()
b = Tensor.zeros(DType.F32, 1).requires_grad_()

for _ in range(200):
    loss = ((x @ w + b - y) ** 2).mean()
    w.grad = b.grad = None
    loss.backward()
    with no_grad():
        w.sub_(w.grad * 0.05)
        b.sub_(b.grad * 0.05)

print(f"learned w = {w.item():.3f}, b = {b.item():.3f}, loss = {loss.item():.6f}")
test = Tensor.from_data([4, 5, 6], 3, 1)
print("predictions at 4, 5, 6:", ", ".join(f"{v:.3f}" for v in (test @ w + b).to_array()))

# autograd against finite differences, in float64
v = Tensor.from_data([0.3, -1.2, 2.0], dtype=DType.F64).requires_grad_()
f = (v.tanh() * v.exp()).sum()
f.backward()
eps = 1e-6
numeric = []
for i in range(3):
    plus, minus = v.detach().numpy().copy(), v.detach().numpy().copy()
    plus[i] += eps
    minus[i] -= eps
    fp = (Tensor.from_numpy(plus).tanh() * Tensor.from_numpy(plus).exp()).sum().item()
    fm = (Tensor.from_numpy(minus).tanh() * Tensor.from_numpy(minus).exp()).sum().item()
    numeric.append((fp - fm) / (2 * eps))
diff = max(abs(a - n) for a, n in zip(v.grad.to_array(), numeric))
print(f"autograd vs finite differences: largest difference {diff:.2e}")
