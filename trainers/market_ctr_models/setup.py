from setuptools import find_packages, setup

setup(
    name="market_ctr_models",
    version="1.0",
    packages=find_packages(),
    # Installed into the Ray job's environment; kept equal to the platform's pins so a
    # cluster that already has them installs nothing.
    install_requires=[
        "xgboost-cpu==3.2.0",
        "pandas>=2.3,<3",
        "pyarrow==26.0.1",
        "pyiceberg==0.12.0",
        "fsspec==2026.9.0",
        "scikit-learn==1.9.1",
        "matplotlib==3.11.2",
    ],
)
