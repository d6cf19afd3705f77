"""src/kernels/common/wgmma_sm90_generated.h is what scripts/generate_wgmma.py writes
today: a change to the generator (or a hand edit of the header) without regenerating
fails here. (ptxas assembling every wrapper is tests/cpu/wgmma_instantiation_sm90.cu.)"""
import importlib.util
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def main():
    spec = importlib.util.spec_from_file_location("generate_wgmma", ROOT / "scripts" / "generate_wgmma.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    header = ROOT / generator.OUT
    expected = generator.generate()
    actual = header.read_text()
    if actual != expected:
        differing = next(i for i, (a, b) in enumerate(zip(actual.splitlines() + [""], expected.splitlines() + [""]))
                         if a != b)
        print(f"{header} is stale: line {differing + 1} differs from what scripts/generate_wgmma.py writes; "
              "run `python3 scripts/generate_wgmma.py` from the repository root")
        return 1
    shapes = sum(line.startswith("__device__ __forceinline__ void wgmma_") for line in actual.splitlines())
    print(f"{header.relative_to(ROOT)} matches the generator ({shapes} wrappers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
