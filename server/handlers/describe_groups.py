"""DescribeGroups: state, protocol and members (with their metadata and assignments) of groups.

Behaviour / version notes:
- v0-6.  An unknown group is reported in state "Dead" (v6+: with GROUP_ID_NOT_FOUND, KIP-1043).
  v3+ authorized operations when asked; v4+ group instance ids.
  Member metadata and the protocol name are shown only while the group is Stable, as Kafka does.
- A group named twice is described once: each repeat of a big group (members' metadata and
  assignments) would add its whole description to the response (clients never repeat one).
- ACLs (as Kafka's KafkaApis): Describe on each group, else that group answers
  GROUP_AUTHORIZATION_FAILED with empty state, protocol type and protocol, no members and
  authorized operations -2147483648 (these come first in the answer, as Kafka puts them).  With
  include_authorized_operations (v3+) a described group without error carries the bit set of the
  group operations the principal may do (Read, Describe, Delete, DescribeConfigs, AlterConfigs).
- On a broker that does not lead ``__consumer_offsets``' partition: NOT_COORDINATOR for each group
  (COORDINATOR_LOAD_IN_PROGRESS while it opens it).
"""
from trireme.server.authorized_operations import authorized_operations
from trireme.server.dispatch import handles
from trireme.server.handlers import first_of_each
from trireme.state.acls import Operation, ResourceType
from trireme.wire import error_codes as E

OPERATIONS_OMITTED = -2**31


def _describe_groups(ctx, request):
    coordinator = ctx.broker.groups.coordinator
    response = ctx.response()
    gcls = type(response).DescribedGroup
    mcls = gcls.DescribedGroupMember
    allowed = []
    for group_id in first_of_each(request.groups):
        if ctx.authorize(Operation.DESCRIBE, ResourceType.GROUP, group_id):
            allowed.append(group_id)
        else:
            response.groups.append(gcls(error_code=E.GROUP_AUTHORIZATION_FAILED.code, group_id=group_id,
                                        group_state="", protocol_type="", protocol_data="", members=[],
                                        authorized_operations=OPERATIONS_OMITTED))
    for g in coordinator.describe_groups(allowed, ctx.api_version):
        out = gcls(error_code=g.error, group_id=g.group_id, group_state=g.state,
                   protocol_type=g.protocol_type or "", protocol_data=g.protocol_name or "")
        out.members = [mcls(member_id=m.member_id, group_instance_id=m.group_instance_id,
                            client_id=m.client_id, client_host=m.client_host,
                            member_metadata=m.metadata or b"", member_assignment=m.assignment or b"")
                       for m in g.members]
        if ctx.api_version >= 3 and request.include_authorized_operations and not g.error:
            out.authorized_operations = authorized_operations(ctx, ResourceType.GROUP, g.group_id)
        response.groups.append(out)
    return response


@handles("DescribeGroups", 0, 6)
def describe_groups(ctx, request):
    # Commits answered before this request may still be on their way to disk: wait for them, so a
    # pipelined read sees what was acknowledged (Kafka handles one request per connection at a time).
    return ctx.broker.groups.after_staged_writes(lambda: _describe_groups(ctx, request))
