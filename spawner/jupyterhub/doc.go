// Package jupyterhub holds no Go code: it is the home of gpubroker's
// JupyterHub spawner class, the Python package gpubroker-jupyterhub
// (module gpubroker_jupyterhub, README.md). Its Go tests run that package's
// pytest suite against the fake broker in tests/fakebroker.py, and install
// the package into a virtual environment to check that JupyterHub finds the
// class by its entry point name, "gpubroker".
package jupyterhub
