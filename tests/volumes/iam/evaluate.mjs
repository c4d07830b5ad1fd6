// Evaluates AWS IAM policies with @cloud-copilot/iam-simulate (pinned in package.json), for
// tests/volumes/test_scoped_policy.py. Reads JSON on stdin:
//   {"principal": ARN, "policies": [{"name", "policy"}], "requests": [{"action", "resource",
//    "context"?}]}
// and prints, per request, "Allowed", "ImplicitlyDenied" or "ExplicitlyDenied". The simulator
// does not model STS session policies yet, so each policy is evaluated alone as an identity
// policy, and a request is allowed only when every one of them allows it: a role's session gets
// the intersection of the role's policies and the session policy (AWS's evaluation logic). A
// request or policy the simulator finds invalid (an unknown action, a resource the action does
// not take, a malformed policy) exits 1 with why: it must never pass as a denial.
import { runSimulation } from '@cloud-copilot/iam-simulate'

const chunks = []
for await (const chunk of process.stdin) chunks.push(chunk)
const input = JSON.parse(Buffer.concat(chunks).toString('utf8'))
const account = input.principal.split(':')[4]

async function decide(policy, request) {
  const response = await runSimulation(
    {
      identityPolicies: [policy],
      serviceControlPolicies: [],
      resourceControlPolicies: [],
      ...(request.resourcePolicy ? { resourcePolicy: request.resourcePolicy } : {}),
      request: {
        action: request.action,
        principal: input.principal,
        resource: { accountId: account, resource: request.resource },
        contextVariables: request.context || {}
      }
    },
    {}
  )
  if (response.resultType !== 'single') {
    const why = response.resultType === 'error' ? response.errors : response.resultType
    throw new Error(`${request.action} on ${request.resource}: ${JSON.stringify(why)}`)
  }
  return response.overallResult
}

const decisions = []
try {
  for (const request of input.requests) {
    let decision = 'Allowed'
    for (const policy of input.policies) {
      const own = await decide(policy, request)
      if (own !== 'Allowed') {
        decision = own
        break
      }
    }
    decisions.push(decision)
  }
} catch (error) {
  process.stderr.write(`${error.message}\n`)
  process.exit(1)
}
process.stdout.write(JSON.stringify(decisions))
