#include "hostd-a.h"
#include "hostd-b.h"
