package reclaim

// Audit actions and targets of the policy.
const (
	AuditPolicyUpdate = "reclaim-policy.update"
	AuditTargetPolicy = "reclaim-policy"
)
