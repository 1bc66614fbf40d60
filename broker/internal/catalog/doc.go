// Package catalog loads the profiles-and-quotas file: the offers users pick
// from (fleet.Profile) and the caps on what they may hold (fleet.Quotas).
//
// The file is YAML (decoded through sigs.k8s.io/yaml, so the field names are
// the JSON tags below):
//
//	profiles:
//	  - name: small            # DNS-1123 label, unique
//	    displayName: Small     # required
//	    description: ...       # optional
//	    image: quay.io/jupyter/minimal-notebook:latest   # required
//	    cpu: "1"               # Kubernetes quantity, > 0, required
//	    memory: 4Gi            # Kubernetes quantity, > 0, required
//	    slice: {memoryMiB: 8192, computePercent: 20, computeLimitPercent: 50}
//	    model: ""              # optional GPU model constraint, e.g. "NVIDIA H200"
//	    groups: []             # empty: everyone
//	    command: [...]         # optional: the notebook container's command
//	    args: [...]            # optional: its args (see below)
//	quotas:
//	  defaultUser: {servers: 2, memoryMiB: 32768, computePercent: 100}
//	  users: {alice: {servers: 4}}
//	  groups: {ml-team: {servers: 20, memoryMiB: 400000, computePercent: 400}}
//
// Rules:
//   - Parsing is strict: unknown fields, duplicate keys and wrong types are
//     errors. Every problem in the file is reported at once (errors.Join),
//     each naming its place, for example
//     "profiles[2] (gpu-large): slice computeLimitPercent must be at least computePercent (30), got 20".
//   - As in kubectl, YAML is read as YAML 1.1 through sigs.k8s.io/yaml:
//     numbers are accepted for string fields (cpu: 2), and an unquoted yes,
//     no, on, off, y or n is a boolean, so quote such names.
//   - computeLimitPercent may be omitted; it then equals computePercent (no
//     burst).
//   - In quotas a zero or missing field means unlimited; negative values are
//     errors. A user's own entry replaces defaultUser (see fleet.Quotas).
//   - command and args start the notebook when a create request sets
//     neither (Kubernetes meaning: command replaces the image's ENTRYPOINT,
//     args its CMD). A profile with neither gets DefaultArgs, the Jupyter
//     docker-stacks start script under $(GPUBROKER_BASE_URL); an explicit
//     empty list keeps the image's own. $(GPUBROKER_BASE_URL) and
//     $(GPUBROKER_POD_IP) expand as in any pod; the notebook's token is
//     JUPYTER_TOKEN from the server's Secret.
//   - Profiles keep the file's order.
//
// A *Catalog is immutable after Parse and safe for concurrent use; its
// accessors return copies. Default returns the embedded default.yaml that dev
// mode uses: three profiles sized for one NVIDIA H200 (143771 MiB, 132 SMs).
package catalog
