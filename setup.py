"""Ships the device sources (isa/, ops/, scheduler/, runtime/) inside the wheel as gpuvm/_device."""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

DEVICE_DIRS = ("isa", "ops", "scheduler", "runtime")


class BuildWithDeviceSources(build_py):
    def run(self) -> None:
        super().run()
        root = Path(__file__).resolve().parent
        dst = Path(self.build_lib) / "gpuvm" / "_device"
        for d in DEVICE_DIRS:
            shutil.copytree(root / d, dst / d, dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildWithDeviceSources})
