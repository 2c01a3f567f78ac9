"""The FOCUS paper's CIFAR-10 experiment (appendix G) timed three ways, side by side in one process.

Workload: the appendix-G setting on synthetic CIFAR-shaped data (no download): 50,000 uint8
training images 3x32x32 and 10,000 test images, 10 classes; N = 32 clients split by Dirichlet
alpha = 0.05; Bernoulli participation with the FOCUS rate preset (about 6.8 clients a round);
SG-FOCUS with tau = 3, eta = 2e-3, batch 128; the paper's 3-layer CNN (541,094 parameters);
random crop (padding 4) and horizontal flip on every side. The three runners take the same
rounds of the same participation mask:

- vectorized: focusfl's vectorized engine (the formulation it measures at start is printed);
- reference: focusfl's per-client reference loop (same problem, one client at a time);
- floor: one forward and backward pass of the model per client and local step on 128
  ready-made inputs (channels-last, the fastest layout on CPUs), nothing else: on a CPU the
  least work any engine must do per round; floor / reference bounds what batching clients can
  gain over the reference loop on the machine;
- grouped floor: every active client's forward and backward passes as the grouped calls of
  focusfl's formulation, on inputs drawn and standardised beforehand, nothing else: the floor on
  a GPU, where one grouped call beats a pass per client (engine / grouped floor says how close
  the engine comes);
- authors: a re-creation of the structure of the authors' published loop (BichengYing/FedASL):
  a model per client that pulls the server's parameters, a torch DataLoader per client over a
  Dataset whose items go through the standard CIFAR transforms one sample at a time (PIL image,
  RandomCrop(32, padding=4), RandomHorizontalFlip, ToTensor, Normalize), clients in turn, flat
  parameter and gradient vectors built with torch.cat as in their utilities, and their server
  update y += sum of pushed u, x -= eta * y. torchvision's transforms are re-created here in
  PIL and torch with the same semantics (torchvision is not a dependency, and its wheels do not
  load against every torch build).

Evaluation is timed on its own: focusfl now (inference mode, channels-last where measured
fastest, eval_batch=auto, test set standardised once), focusfl as it was before (NCHW, batches
of 1000, standardising every batch), and the authors' way (a DataLoader of 256 with ToTensor
and Normalize per sample).

Every figure is the median of --repeats passes with the runners interleaved in each pass (a
shared machine is noisy); the 10,000-round wall clock is extrapolated as
10,000 x (seconds per round, scaled to the run's mean participation) + 201 evaluations
(every 50 rounds and at round 0).

    python benchmarks/paper_cifar.py                    # CPU, 2 threads
    python benchmarks/paper_cifar.py --threads 1
    python benchmarks/paper_cifar.py --device cuda      # where a GPU exists
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.func import functional_call
from torch.utils.data import DataLoader

from focusfl.algorithms import make_algorithm
from focusfl.data import Dataset, ImageData
from focusfl.engine.reference import reference_round
from focusfl.engine.simulate import active_sets
from focusfl.engine.vectorized import vectorized_round
from focusfl.participation import make_participation
from focusfl.problems.models import make_model
from focusfl.problems.nn import NeuralNetwork

CLIENTS, ALPHA, TAU, LR, BATCH = 32, 0.05, 3, 2e-3, 128
ROUNDS_PAPER, EVAL_EVERY_PAPER = 10_000, 50
# The CIFAR-10 channel statistics of the authors' Normalize.
MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)


def synthetic_cifar(train: int, test: int) -> Dataset:
    rng = np.random.default_rng(0)
    def split(count):
        return ImageData(rng.integers(0, 256, (count, 3, 32, 32), dtype=np.uint8), rng.integers(0, 10, count))
    return Dataset("synthetic-cifar10", split(train), split(test), 10)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- focusfl ------------------------------------------------------------------------------------
class Focusfl:
    def __init__(self, problem: NeuralNetwork, actives, round_fn, seed: int = 0):
        self.problem, self.actives, self.round_fn, self.seed = problem, actives, round_fn, seed
        self.algorithm = make_algorithm("sg_focus", lr=LR, local_steps=TAU)
        self.state = self.algorithm.init(problem.initial_point(), problem.num_clients)
        self.first = True

    def run(self, rounds: range) -> None:
        for r in rounds:
            self.state = self.round_fn(self.algorithm, self.state, self.problem, self.actives[r], r, self.seed,
                                       donate=not self.first)
            self.first = False
        float(self.state.server.x[0])  # waits for the device


class Floor:
    """Only the model's forward and backward passes that a round needs, back to back."""

    def __init__(self, problem: NeuralNetwork, actives, device: torch.device):
        self.actives = actives
        self.model = make_model("focus-cnn", (3, 32, 32), 10).to(device).to(memory_format=torch.channels_last)
        images = problem.train_images[:BATCH]
        self.inputs = problem.inputs(images).contiguous(memory_format=torch.channels_last)
        self.labels = problem.train_labels[:BATCH]

    def run(self, rounds: range) -> None:
        for r in rounds:
            for _ in range(self.actives[r].numel() * TAU):
                self.model.zero_grad(set_to_none=True)
                F.cross_entropy(self.model(self.inputs), self.labels).backward()
        float(next(self.model.parameters()).grad[0, 0, 0, 0])


class GroupedFloor:
    """The floor on a GPU: every active client's forward and backward passes of a round as the
    grouped calls focusfl's formulation makes (problem.grouped.client_grads, chunked as the
    formulation says), on inputs drawn and standardised once beforehand, nothing else: no draw,
    no crop, no update. On a GPU one grouped call is faster than a pass per client, so the
    per-client floor bounds nothing there; this one bounds any engine of this formulation."""

    def __init__(self, problem: NeuralNetwork, actives):
        self.problem, self.actives = problem, actives
        chunk, layout = problem.formulation()
        self.chunk, self.channels_last = chunk, layout == "channels_last"
        grouped, data = problem.grouped, problem.client_data
        clients = torch.arange(problem.num_clients, device=problem.device)
        sizes = data.sizes
        largest = int(sizes.max())
        hwc = self.channels_last and grouped.batched_sequential and grouped.has_convolutions
        images, self.labels, self.weights, self.keys = (
            t[0] for t in data.draw(0, 0, clients, torch.zeros(1, dtype=torch.int64, device=problem.device), sizes,
                                     min(BATCH, largest), largest, hwc))
        self.inputs = problem.inputs(images)
        self.z = problem.initial_point().expand(problem.num_clients, -1).clone()

    def run(self, rounds: range) -> None:
        grads = self.problem.grouped.client_grads
        for r in rounds:
            n = self.actives[r].numel()
            step = self.chunk or max(n, 1)
            for _ in range(TAU):
                for start in range(0, n, step):
                    rows = slice(start, min(start + step, n))
                    grads(self.z[rows], self.inputs[rows], self.labels[rows], self.weights[rows], self.keys[rows],
                          self.channels_last)


# -- the authors' loop, re-created --------------------------------------------------------------
class RandomCropPadded:
    """RandomCrop(size, padding): pad with black, then a uniformly placed size x size window."""

    def __init__(self, size: int, padding: int):
        self.size, self.padding = size, padding

    def __call__(self, image: Image.Image) -> Image.Image:
        width, height = image.size
        padded = Image.new(image.mode, (width + 2 * self.padding, height + 2 * self.padding))
        padded.paste(image, (self.padding, self.padding))
        top = int(torch.randint(0, padded.size[1] - self.size + 1, (1,)))
        left = int(torch.randint(0, padded.size[0] - self.size + 1, (1,)))
        return padded.crop((left, top, left + self.size, top + self.size))


class RandomHorizontalFlip:
    def __call__(self, image: Image.Image) -> Image.Image:
        return image.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if float(torch.rand(1)) < 0.5 else image


def to_tensor(image: Image.Image) -> torch.Tensor:
    """ToTensor: HWC uint8 -> CHW float in [0, 1]."""
    array = torch.from_numpy(np.array(image, np.uint8, copy=True))
    return array.permute(2, 0, 1).contiguous().to(torch.get_default_dtype()).div(255)


class Normalize:
    def __init__(self, mean, std):
        self.mean, self.std = mean, std

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        mean = torch.as_tensor(self.mean, dtype=tensor.dtype)[:, None, None]
        std = torch.as_tensor(self.std, dtype=tensor.dtype)[:, None, None]
        return tensor.clone().sub_(mean).div_(std)


class CifarItems(torch.utils.data.Dataset):
    """A client's samples as (transformed image, label) items, one PIL image at a time."""

    def __init__(self, images_hwc: np.ndarray, labels: np.ndarray, indices: np.ndarray, transforms):
        self.images, self.labels, self.indices, self.transforms = images_hwc, labels, indices, transforms

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int):
        image = Image.fromarray(self.images[self.indices[k]])
        for transform in self.transforms:
            image = transform(image)
        return image, int(self.labels[self.indices[k]])


def forever(loader):
    while True:
        yield from loader


def flat_parameters(model) -> torch.Tensor:
    return torch.cat([p.data.reshape(-1) for p in model.parameters()])


def set_flat_parameters(model, flat: torch.Tensor) -> None:
    offset = 0
    for p in model.parameters():
        p.data.copy_(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()


class AuthorsLoop:
    """SG-FOCUS as the authors' loop runs it: per-client models and DataLoaders, clients in turn."""

    def __init__(self, problem: NeuralNetwork, dataset: Dataset, actives, device: torch.device):
        self.actives, self.device = actives, device
        self.server = make_model("focus-cnn", (3, 32, 32), 10).to(device)
        set_flat_parameters(self.server, problem.initial_point().to(device))
        self.models = [copy.deepcopy(self.server) for _ in range(CLIENTS)]
        images_hwc = np.ascontiguousarray(dataset.train.images.transpose(0, 2, 3, 1))
        transforms = [RandomCropPadded(32, 4), RandomHorizontalFlip(), to_tensor, Normalize(MEAN, STD)]
        owned = problem.client_order.cpu().numpy()
        starts, sizes = problem.client_starts.cpu().numpy(), problem.sizes.cpu().numpy()
        self.batches = [
            forever(DataLoader(CifarItems(images_hwc, dataset.train.labels, owned[starts[i] : starts[i] + sizes[i]],
                                          transforms), batch_size=BATCH, shuffle=True))
            for i in range(CLIENTS)
        ]
        self.y = torch.zeros_like(flat_parameters(self.server))
        self.g_prev = [torch.zeros_like(self.y) for _ in range(CLIENTS)]

    def local_update(self, i: int) -> torch.Tensor:
        model = self.models[i]
        set_flat_parameters(model, flat_parameters(self.server))  # pull
        u = torch.zeros_like(self.y)
        for step in range(TAU):
            if step > 0:
                set_flat_parameters(model, flat_parameters(model) - LR * u)
            model.zero_grad()
            inputs, labels = next(self.batches[i])
            inputs, labels = inputs.to(self.device), labels.to(self.device)
            F.cross_entropy(model(inputs), labels).backward()
            grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            u = u + grad - self.g_prev[i]
            self.g_prev[i] = grad
        return u

    def run(self, rounds: range) -> None:
        for r in rounds:
            for i in self.actives[r].tolist():
                self.y += self.local_update(i)
            set_flat_parameters(self.server, flat_parameters(self.server) - LR * self.y)
        float(flat_parameters(self.server)[0])


# -- evaluation ------------------------------------------------------------------------------------
def focusfl_eval_now(problem: NeuralNetwork, x: torch.Tensor):
    return lambda: problem.metrics(x)


def focusfl_eval_before(problem: NeuralNetwork, x: torch.Tensor):
    """The evaluation of focusfl before this change: NCHW, batches of 1000, no_grad, inputs
    standardised at every evaluation."""
    def run():
        total = torch.zeros((), dtype=torch.float64, device=problem.device)
        with torch.no_grad():
            for start in range(0, len(problem.test_labels), 1000):
                images = problem.test_images[start : start + 1000]
                logits = functional_call(problem.grouped.eval_model, problem.unflatten(x), (problem.inputs(images),))
                total += F.cross_entropy(logits, problem.test_labels[start : start + 1000], reduction="sum")
        return float(total)
    return run


def authors_eval(authors: AuthorsLoop, dataset: Dataset):
    images_hwc = np.ascontiguousarray(dataset.test.images.transpose(0, 2, 3, 1))
    items = CifarItems(images_hwc, dataset.test.labels, np.arange(len(dataset.test.labels)),
                       [to_tensor, Normalize(MEAN, STD)])
    loader = DataLoader(items, batch_size=256)

    def run():
        authors.server.eval()
        total, correct = 0.0, 0
        with torch.no_grad():
            for inputs, labels in loader:
                inputs, labels = inputs.to(authors.device), labels.to(authors.device)
                logits = authors.server(inputs)
                total += float(F.cross_entropy(logits, labels, reduction="sum"))
                correct += int((logits.argmax(1) == labels).sum())
        authors.server.train()
        return total, correct
    return run


def timed(fn, device, clock=time.perf_counter) -> float:
    sync(device)
    start = clock()
    fn()
    sync(device)
    return clock() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="rounds per timed pass (the same rounds for every runner)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--train", type=int, default=50_000, help="synthetic training images")
    parser.add_argument("--test", type=int, default=10_000, help="synthetic test images")
    parser.add_argument("--skip-eval", action="store_true")
    parser.add_argument("--client-chunk", default="auto",
                        help="clients per batched call of focusfl's engine (default auto: the rule; measure: timed)")
    parser.add_argument("--layout", default="auto", choices=["auto", "measure", "channels_last", "nchw"])
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="cpu: this process's CPU time (with --threads 1 on a machine shared with other "
                             "jobs, closer to what a quiet machine's wall clock would show)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    device = torch.device(args.device)
    dataset = synthetic_cifar(args.train, args.test)

    chunk_option = args.client_chunk if args.client_chunk in ("auto", "measure") else int(args.client_chunk)
    problem = NeuralNetwork(dataset=dataset, model="focus-cnn", clients=CLIENTS, alpha=ALPHA, batch=BATCH,
                            augment="crop-flip", device=device, client_chunk=chunk_option, layout=args.layout)
    setup = time.perf_counter()
    chunk, layout = problem.formulation()
    setup = time.perf_counter() - setup
    process = make_participation("bernoulli", CLIENTS, seed=0)
    mask = process.mask(ROUNDS_PAPER)
    actives = active_sets(mask, device)
    warm, timed_rounds = range(0, 2), range(2, 2 + args.rounds)
    active_timed = float(mask[timed_rounds.start : timed_rounds.stop].sum(1).mean())
    active_paper = float(mask.sum(1).mean())

    runners = {
        "vectorized": Focusfl(problem, actives, vectorized_round),
        "reference": Focusfl(problem, actives, reference_round),
        "floor": Floor(problem, actives, device),
        "grouped floor": GroupedFloor(problem, actives),
        "authors": AuthorsLoop(problem, dataset, actives, device),
    }
    print(f"{args.clock} clock; device {device}, torch {torch.__version__}, {torch.get_num_threads()} threads; model {problem.dim:,} "
          f"parameters; N={CLIENTS}, alpha={ALPHA}, tau={TAU}, batch={BATCH}, crop+flip on every side")
    print(f"focusfl's formulation: client_chunk={chunk or 'all'}, layout={layout} ({setup:.1f} s to choose)")
    print(f"timed rounds {timed_rounds.start}..{timed_rounds.stop - 1}: {active_timed:.2f} active clients on average "
          f"(the paper's 10,000 rounds: {active_paper:.2f}); median of {args.repeats} passes, interleaved")
    for runner in runners.values():
        runner.run(warm)
    seconds = {name: [] for name in runners}
    for _ in range(args.repeats):
        for name, runner in runners.items():
            seconds[name].append(timed(lambda: runner.run(timed_rounds), device, clock) / args.rounds)
    per_round = {name: statistics.median(values) for name, values in seconds.items()}

    evals = {}
    if not args.skip_eval:
        x = runners["vectorized"].state.server.x
        evaluations = {
            "focusfl now": focusfl_eval_now(problem, x),
            "focusfl before": focusfl_eval_before(problem, x),
            "authors": authors_eval(runners["authors"], dataset),
        }
        for fn in evaluations.values():
            fn()  # warm-up (and focusfl's standardised test set, made once per run)
        times = {name: [] for name in evaluations}
        for _ in range(args.repeats):
            for name, fn in evaluations.items():
                times[name].append(timed(fn, device, clock))
        evals = {name: statistics.median(values) for name, values in times.items()}

    print(f"\n{'runner':<14} {'s/round':>8} {'spread':>15} {'vs authors':>11} {'vs reference':>13} {'10,000 rounds':>14}")
    evaluations_paper = ROUNDS_PAPER // EVAL_EVERY_PAPER + 1
    eval_for = {"vectorized": "focusfl now", "reference": "focusfl now", "floor": "focusfl now",
                "grouped floor": "focusfl now", "authors": "authors"}
    for name, value in per_round.items():
        scaled = value * active_paper / active_timed
        total = ROUNDS_PAPER * scaled + evaluations_paper * evals.get(eval_for[name], 0.0)
        spread = f"{min(seconds[name]):.3f}-{max(seconds[name]):.3f}"
        print(f"{name:<14} {value:>8.3f} {spread:>15} {per_round['authors'] / value:>10.2f}x "
              f"{per_round['reference'] / value:>12.2f}x {total / 3600:>12.2f} h")
    if evals:
        print(f"\nevaluation of {args.test:,} test images (s): " + ", ".join(
            f"{name} {value:.2f}" for name, value in evals.items()))
        print(f"focusfl now vs before: {evals['focusfl before'] / evals['focusfl now']:.2f}x; "
              f"vs authors: {evals['authors'] / evals['focusfl now']:.2f}x")
    print(f"(10,000 rounds: seconds per round scaled to {active_paper:.2f} active clients, plus "
          f"{evaluations_paper} evaluations; the authors' published loop took 6,380 s on their GPU)")


if __name__ == "__main__":
    main()
