"""``python -m skyfed.lab``: the lab command group without the umbrella CLI."""

from skyfed.lab.cli import lab

if __name__ == "__main__":
    lab(prog_name="python -m skyfed.lab")
